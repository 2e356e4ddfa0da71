"""The leader's view of each follower, and majority arithmetic over a configuration.

A follower's `Progress` moves between three states (etcd raft's design):

- PROBE: the leader does not know where the follower's log matches its own; it sends one append
  at a time and waits for the answer (or the next heartbeat response) before sending another.
- REPLICATE: the match is known; appends are pipelined optimistically, bounded by the in-flight
  message and byte limits (flow control).
- SNAPSHOT: the follower needs entries the leader has compacted; snapshot chunks are sent one at
  a time until the follower has the whole snapshot.

Not thread-safe: owned by one `RaftNode`.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable

from eventlog.raft.types import ConfState, SnapshotMeta


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    __slots__ = ("match", "next", "state", "probe_sent", "inflight", "inflight_bytes", "snapshot",
                 "snapshot_offset", "snapshot_sent_tick", "recent_active", "active_tick", "last_progress_tick",
                 "heartbeat_round")

    def __init__(self, next_index: int, tick: int) -> None:
        self.match = -1                 # highest index known to be durable on the follower
        self.next = next_index          # next index to send
        self.state = ProgressState.PROBE
        self.probe_sent = False         # PROBE: an append is outstanding
        self.inflight: deque[tuple[int, int]] = deque()  # REPLICATE: (last index, bytes) per append
        self.inflight_bytes = 0
        self.snapshot: SnapshotMeta | None = None  # SNAPSHOT: the one being sent
        self.snapshot_offset = 0
        self.snapshot_sent_tick = 0
        self.recent_active = False      # heard from it since the last check-quorum round
        self.active_tick = -1           # when the leader last heard from it (-1: not in this term)
        self.last_progress_tick = tick  # when `match` last advanced (or replication (re)started)
        self.heartbeat_round = 0        # latest heartbeat round it acknowledged (leases, ReadIndex)

    def become_probe(self, tick: int) -> None:
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.probe_sent = False
        self._clear_inflight()
        self.snapshot = None
        self.last_progress_tick = tick

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self._clear_inflight()

    def become_snapshot(self, meta: SnapshotMeta, tick: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.snapshot = meta
        self.snapshot_offset = 0
        self.snapshot_sent_tick = tick
        self._clear_inflight()

    def _clear_inflight(self) -> None:
        self.inflight.clear()
        self.inflight_bytes = 0

    def maybe_update(self, index: int, tick: int) -> bool:
        """The follower has everything through `index`; True if that is news."""
        updated = index > self.match
        if updated:
            self.match = index
            self.last_progress_tick = tick
        self.next = max(self.next, index + 1)
        self.probe_sent = False
        while self.inflight and self.inflight[0][0] <= index:
            self.inflight_bytes -= self.inflight.popleft()[1]
        return updated

    def sent(self, last_index: int, size: int) -> None:
        """An append through `last_index` went out."""
        if self.state is ProgressState.REPLICATE:
            self.next = last_index + 1
            self.inflight.append((last_index, size))
            self.inflight_bytes += size
        elif self.state is ProgressState.PROBE:
            self.probe_sent = True

    def is_paused(self, max_msgs: int, max_bytes: int) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.SNAPSHOT:
            return True
        return len(self.inflight) >= max_msgs or self.inflight_bytes >= max_bytes

    def __repr__(self) -> str:
        return f"Progress({self.state.value}, match={self.match}, next={self.next}, inflight={len(self.inflight)})"


def majority(voters: Iterable[int]) -> int:
    return len(tuple(voters)) // 2 + 1


def committed_index(conf: ConfState, matches: dict[int, int]) -> int:
    """The largest index that a majority of voters hold (-1 when there is none)."""
    indexes = sorted((matches.get(v, -1) for v in conf.voters), reverse=True)
    if not indexes:
        return -1
    return indexes[majority(conf.voters) - 1]


def vote_result(conf: ConfState, votes: dict[int, bool]) -> bool | None:
    """True when a majority granted, False when a majority can no longer grant, else None."""
    need = majority(conf.voters)
    granted = sum(1 for v in conf.voters if votes.get(v) is True)
    rejected = sum(1 for v in conf.voters if votes.get(v) is False)
    if granted >= need:
        return True
    if len(conf.voters) - rejected < need:
        return False
    return None
