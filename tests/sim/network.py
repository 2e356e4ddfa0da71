"""The fake network: delivers Raft messages between simulated nodes, with faults.

Faults, each drawn per message from the cluster's one random source, and what they may break:

- loss: any message may vanish (breaks liveness only; Raft retries with heartbeats and probes);
- duplication: a message may arrive twice (stale acks, repeated votes and snapshot chunks);
- delay and reordering: each copy takes `min_delay..max_delay` ticks, and with probability
  `reorder` up to `reorder_ticks` more, so messages overtake each other (stale appends and acks
  from old terms, a TimeoutNow arriving after the transfer was abandoned);
- a paused sender (SIGSTOP mid-turn): what it sent in its last tick and is not delivered yet is
  taken back (`take_sent`) and sent again when it resumes, as its transport flushes it then;
- partitions: a set of blocked (src, dst) pairs; blocking both directions is a symmetric
  partition, one direction an asymmetric one (a leader that can send but not hear, a follower that
  hears but cannot answer). Checked at delivery: a message in flight when the link is cut is lost.

Messages to a crashed node are dropped by the cluster at delivery; a paused node's wait in its inbox. Time is ticks; a message sent at
tick t arrives at t + 1 or later. Not thread-safe; one per simulated cluster.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from eventlog.raft.types import Message


@dataclass(slots=True)
class NetworkFaults:
    loss: float = 0.0
    dup: float = 0.0
    min_delay: int = 1
    max_delay: int = 1
    reorder: float = 0.0
    reorder_ticks: int = 0


class Network:
    def __init__(self, rng: random.Random, faults: NetworkFaults) -> None:
        assert faults.min_delay >= 1
        self._rng = rng
        self.faults = faults
        self.blocked: set[tuple[int, int]] = set()
        self._queue: list[tuple[int, int, Message, int]] = []   # (arrival tick, seq, message, sent at)
        self._seq = 0
        self.sent = 0
        self.dropped = 0
        self.delivered = 0

    def send(self, m: Message, now: int) -> None:
        f = self.faults
        rng = self._rng
        self.sent += 1
        if f.loss and rng.random() < f.loss:
            self.dropped += 1
            return
        copies = 2 if f.dup and rng.random() < f.dup else 1
        for _ in range(copies):
            delay = f.min_delay if f.max_delay == f.min_delay else rng.randint(f.min_delay, f.max_delay)
            if f.reorder and rng.random() < f.reorder:
                delay += rng.randint(1, f.reorder_ticks)
            self._seq += 1
            heapq.heappush(self._queue, (now + delay, self._seq, m, now))

    def due(self, now: int) -> list[Message]:
        """Messages arriving at tick `now`, in arrival order (partitioned links drop theirs)."""
        out: list[Message] = []
        q = self._queue
        while q and q[0][0] <= now:
            m = heapq.heappop(q)[2]
            if (m.src, m.dst) in self.blocked:
                self.dropped += 1
            else:
                out.append(m)
        self.delivered += len(out)
        return out

    def take_sent(self, src: int, since: int) -> list[Message]:
        """Take back what `src` sent from tick `since` on and is not delivered yet (in send order,
        one copy each): it was still in the sender's buffers when its process was stopped."""
        taken = sorted((e for e in self._queue if e[2].src == src and e[3] >= since), key=lambda e: e[1])
        if not taken:
            return []
        gone = {id(e) for e in taken}
        self._queue = [e for e in self._queue if id(e) not in gone]
        heapq.heapify(self._queue)
        out: list[Message] = []
        for e in taken:
            if not out or out[-1] is not e[2]:
                out.append(e[2])
        return out

    # --- partitions ------------------------------------------------------------------------------

    def cut(self, src: int, dst: int) -> None:
        """Block src -> dst only (one half of an asymmetric partition)."""
        self.blocked.add((src, dst))

    def split(self, side_a: list[int], side_b: list[int]) -> None:
        """A symmetric partition between two groups."""
        for a in side_a:
            for b in side_b:
                self.blocked.add((a, b))
                self.blocked.add((b, a))

    def heal(self) -> None:
        self.blocked.clear()

    def in_flight(self) -> int:
        return len(self._queue)
