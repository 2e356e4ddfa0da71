"""Lease clocks of the leader: when each lease runs out. Only the expiry is an event in the log.

Keepalives are not logged (they would flood the log with heartbeats): the leader keeps the
deadlines in memory and, when a lease runs out, proposes `LeaseExpired`, whose application deletes
the lease and every key and session attached to it. A new leader does not know when its
predecessor last heard from a client, so it restarts every lease's clock with its full TTL
(conservative: a lease can only outlive its TTL, never be cut short by a leader change).

Time is the caller's monotonic clock in seconds. Not thread-safe: the group's loop only.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

RETRY_S = 1.0  # an expiry that did not get applied (dropped proposal, leader change) is proposed again


class LeaseClock:
    """Deadlines of the leases of one group, on its leader."""

    def __init__(self, leases: Iterable[tuple[int, int, int]], now: float) -> None:
        """`leases`: (lease id, ttl ms, version) of every lease in the views; all restart now."""
        self._leases: dict[int, tuple[int, int, float]] = {}   # id -> (ttl ms, version, deadline)
        self._heap: list[tuple[float, int]] = []
        for lease_id, ttl_ms, version in leases:
            self.granted(lease_id, ttl_ms, version, now)

    def __len__(self) -> int:
        return len(self._leases)

    def granted(self, lease_id: int, ttl_ms: int, version: int, now: float) -> None:
        deadline = now + ttl_ms / 1000
        self._leases[lease_id] = (ttl_ms, version, deadline)
        heapq.heappush(self._heap, (deadline, lease_id))

    def ended(self, lease_id: int) -> None:
        self._leases.pop(lease_id, None)

    def keepalive(self, lease_id: int, now: float) -> int | None:
        """Restart a lease's clock; its TTL in ms, or None if there is no such lease."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        ttl_ms, version, _ = lease
        self.granted(lease_id, ttl_ms, version, now)
        return ttl_ms

    def remaining_ms(self, lease_id: int, now: float) -> int | None:
        lease = self._leases.get(lease_id)
        return None if lease is None else max(0, int((lease[2] - now) * 1000))

    def expired(self, now: float) -> list[tuple[int, int]]:
        """(lease id, version) of leases past their deadline; offered again every RETRY_S seconds
        until their expiry is applied (`ended`). Propose them idempotently (one request id each)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            deadline, lease_id = heapq.heappop(self._heap)
            lease = self._leases.get(lease_id)
            if lease is None or lease[2] != deadline:
                continue  # ended, or kept alive since (a newer heap entry holds its deadline)
            ttl_ms, version, _ = lease
            out.append((lease_id, version))
            retry = now + RETRY_S
            self._leases[lease_id] = (ttl_ms, version, retry)
            heapq.heappush(self._heap, (retry, lease_id))
        return out
